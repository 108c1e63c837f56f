"""Local platform services for development and ``make run``: the embedded Kafka
broker (``broker``), a Spark standalone cluster (``spark_cluster``), Airflow
standalone (``airflow``), the Spark Connect server of the proofs (``spark_connect``) and the
fork server of its clients (``fork_server``), and the process management they share (``procs``)."""
