"""Local platform services for development and ``make run``: the embedded Kafka
broker (``broker``), a Spark standalone cluster (``spark_cluster``), Airflow
standalone (``airflow``), the Spark Connect server of the proofs (``spark_connect``) and the
fork server of its clients and of Spark's Python processes (``fork_server``, its launcher
``spark_python``). The process management they share is :mod:`streamlake.procs`."""
