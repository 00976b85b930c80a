"""Entity store: definitions (JSON-Schema-typed), views, records, the filter language, full-text
search, relationships and bulk jobs."""
