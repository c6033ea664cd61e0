"""The records service (Experiment OS): platform events, experiments, agent annotations, audits."""
