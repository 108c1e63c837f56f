"""Spark side: session settings and spark-submit command lines (``session``), and
reading a streaming query's checkpoint, its write-ahead log (``checkpoint``)."""
