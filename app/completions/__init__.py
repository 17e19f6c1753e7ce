"""POST /v1/chat/completions: from a validated request to a settled generation."""
