"""Azure Machine Learning command jobs. azure-ai-ml is imported inside calls only (about 1.5 s)."""
