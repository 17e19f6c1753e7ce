"""API keys: issuing them, storing their digest, and finding the caller of a request."""
