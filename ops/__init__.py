"""The operator's side: the CLIs, the gym builder, demos, the run launcher and its egress proxy, tasks, timeline, dashboard."""
