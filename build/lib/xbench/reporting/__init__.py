"""Results folders, tables, figures and dashboards."""
