"""The HTTP/service kit every app of the gym shares: errors, identity, specs, the service frame, body limits, registries, settings, private files."""
