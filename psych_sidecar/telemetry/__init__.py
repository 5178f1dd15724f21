"""Observability at the edges: Prometheus metrics (`metrics`), OpenTelemetry traces
(`tracing`) and structured logs (`logs`). The domain imports none of it."""
