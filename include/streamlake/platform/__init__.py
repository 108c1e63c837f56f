"""Local platform services for development and ``make run``: the embedded Kafka
broker (``broker``), a Spark standalone cluster (``spark_cluster``), Airflow
standalone (``airflow``), and the process management they share (``procs``)."""
