"""Analytics: event ingest (batched on the `analytics` queue), chat facts, rollups and dashboards."""
