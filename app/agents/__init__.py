"""Agent registry: agents, catalog skills, tool definitions, sub-agents and widgets.

Every resource is stored as one JSONB document holding its full wire representation (so reads
return stored JSON text without re-serialising it) plus the scalar columns that queries,
uniqueness and the single-default invariants need.
"""
