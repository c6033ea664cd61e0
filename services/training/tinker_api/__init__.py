"""The Tinker SDK's wire protocol on the training service (``$RSIGYM_URL/tinker``).

The unmodified ``tinker`` SDK talks to these routes as it would to Tinker's own API: sessions,
LoRA training clients, futures polled through ``/api/v1/retrieve_future``, protobuf bodies for
forward/backward and sampling. The work runs on the local training-loop engine
(services/training/loop). This package never imports the SDK (it mirrors the few types it needs).
"""
