"""What the user writes: the job spec, its fields and messages, spec files, templates, settings."""
