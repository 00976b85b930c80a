"""Operators' signals: Prometheus metrics, OpenTelemetry traces, structured logs."""
