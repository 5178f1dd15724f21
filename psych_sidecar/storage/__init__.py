"""Storage: the only part of psych-sidecar that speaks SQL (SQLAlchemy 2 Core)."""
