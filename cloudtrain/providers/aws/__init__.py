"""Amazon SageMaker training jobs. Everything heavy (boto3, botocore's service model) is imported inside calls."""
