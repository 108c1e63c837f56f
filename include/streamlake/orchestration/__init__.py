"""Airflow-facing pieces: the operator that runs a named job through the Spark
provider, and the task functions the DAGs wire together. DAG files import this
package at parse time, so its modules import the platform lazily."""
