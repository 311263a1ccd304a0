module envpool.dev/tests/cluster/pause

go 1.26.0
