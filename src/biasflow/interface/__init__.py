"""The bottom of the scoring stack: the requests a metric asks of a model (``interface.requests``), imported by
metrics, model adapters, scorers and generators alike and importing none of them."""
