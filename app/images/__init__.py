"""Image generation: POST /api/v1/agents/images (provider adapters, reference fetch, blob storage)."""
