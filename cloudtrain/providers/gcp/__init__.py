"""Google Vertex AI custom jobs. Everything heavy (google-cloud-aiplatform, google-auth) is imported inside calls."""
