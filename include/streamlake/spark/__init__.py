"""Spark side: session settings and spark-submit command lines (``session``), the
interpreter of Spark's Python processes (``interpreter``), the JVMs' class archive
(``class_archive``), and reading a streaming query's checkpoint, its write-ahead log
(``checkpoint``)."""
