"""Base models: the project-built tiny model, SmolLM2 from its GGUF wheel, and loading."""
