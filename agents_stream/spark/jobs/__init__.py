"""Spark batch jobs over an app's topics: :mod:`.audit`, :mod:`.backfill`, :mod:`.reconcile`.

Run them with ``agents-stream spark audit|backfill|reconcile -A module:app`` or
``spark-submit agents_stream/spark/jobs/__main__.py <job> -A module:app``.
"""
