"""POST /v1/embeddings: OpenAI's embeddings API, from a validated request to a settled charge."""
