"""Training backends other than the local torch + peft trainer (``services.training.trainer``)."""
