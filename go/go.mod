module h2-ping-sidecar

go 1.26
