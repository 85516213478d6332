"""The Dagster asset graph: one thin module per pipeline stage. Only dice_pipeline/definitions.py imports this."""
