"""`python -m cloud_spark <job> ...` (also the script spark-submit runs)."""

from cloud_spark.cli import main

raise SystemExit(main())
