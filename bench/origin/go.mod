module sidecar-fsm/bench/origin

go 1.26
