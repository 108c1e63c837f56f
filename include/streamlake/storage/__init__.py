"""Where the lake lives: a local directory or an object store, named by a URI.

:mod:`streamlake.storage.location` parses lake URIs (plain paths, ``file://``,
``s3://``, ``gs://``, ``abfss://``), gathers storage options from the usual
places (``AWS_*``/``GOOGLE_*``/``AZURE_*`` environment variables,
``--storage-option KEY=VALUE``), hands delta-rs and pyarrow what they need,
keeps secrets out of anything printed, and refuses object stores on which two
writers could both commit one Delta version.
"""
