package main

import (
	"math/rand/v2"
	"time"
)

// jitteredAge returns a connection's lifetime: 90-100 % of maxAge, so sidecars started
// together (one per node of a job) do not all rotate, and dial, in the same second.
// Zero maxAge means no rotation and returns 0.
func jitteredAge(maxAge time.Duration) time.Duration {
	if maxAge <= 0 {
		return 0
	}
	spread := int64(maxAge / 10)
	if spread <= 0 {
		return maxAge
	}
	return maxAge - time.Duration(rand.Int64N(spread+1))
}

// scheduleRetire retires c when its jittered age is reached. Retiring takes c out of the
// pool at once, so new requests go to a fresh connection, while requests in flight
// (streams included) finish on c; the state hook closes c when its last one ends.
// It only arms a timer (no ClientConn call), so it may run under p.mu.
func (p *pool) scheduleRetire(c *upConn) {
	age := jitteredAge(p.maxAge)
	if age <= 0 {
		return
	}
	c.timer = time.AfterFunc(age, func() { p.retire(c) })
}

// retire marks c retired, drops it from the pool and closes it if nothing is in flight.
//
// Race closed: acquire may have read retired == false and be about to Reserve. The flag is
// stored before InFlight is read here, and acquire loads it again after a successful
// Reserve and releases the slot if set; so either InFlight here counts the reservation (no
// close; the hook closes later) or acquire sees the flag and never sends on c.
func (p *pool) retire(c *upConn) {
	if c.retired.Swap(true) {
		return
	}
	stats.rotations.Add(1)
	p.remove(c)
	if c.cc.InFlight() == 0 {
		c.cc.Close()
	}
}
