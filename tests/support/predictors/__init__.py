"""Predictor classes of the tests: ``genhook.model`` models and a Cog project (``cog_gray``)."""
