package main

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxParallelDials caps dials in flight: a burst of N requests waits for a few
	// connections instead of dialling N and closing most of them unused (a dial storm).
	maxParallelDials = 4
	// assumedStreams is what a connection is expected to carry before the server's
	// SETTINGS tell (Go's client uses 100 until then too).
	assumedStreams = 100
)

// upConn is one upstream HTTP/2 connection owned by the pool.
type upConn struct {
	cc *http.ClientConn
	// retired is set once, by age rotation; a retired conn takes no new request.
	retired atomic.Bool
	timer   *time.Timer
}

// pool keeps the upstream connections and hands out stream slots. It dials on demand, at
// most one connection per assumedStreams waiting requests (and maxParallelDials at once),
// and lets requests queue for a free slot instead of dialling one connection each. The
// server's MAX_CONCURRENT_STREAMS is respected because slots are taken with
// ClientConn.Reserve, which fails at the limit.
//
// Lock rule: no ClientConn method is called while holding mu. Release, Close and
// RoundTrip may run the state hook synchronously, and the hook takes mu.
type pool struct {
	dial   func(context.Context) (*http.ClientConn, error)
	maxAge time.Duration

	mu sync.Mutex
	// conns is copy-on-write: acquire scans a snapshot without mu.
	conns []*upConn
	// gen counts state changes; a scanner that saw no free slot re-scans if gen moved
	// while it scanned, so a slot freed between its scan and its wait is never missed.
	gen uint64
	// wake is closed (and cleared) on the next change; created by the first waiter.
	wake    chan struct{}
	waiting int
	dialing int
	perConn int
	// fails counts failed dials and lastErr is the latest: requests that waited for a
	// dial that failed get its error (a 502) rather than waiting for another.
	fails   uint64
	lastErr error
	closed  bool
}

func newPool(dial func(context.Context) (*http.ClientConn, error), maxAge time.Duration) *pool {
	return &pool{dial: dial, maxAge: maxAge, perConn: assumedStreams}
}

// acquire returns a connection with one stream slot reserved for the caller, who must
// consume it with exactly one RoundTrip or give it back with Release.
func (p *pool) acquire(ctx context.Context) (*upConn, error) {
	var startFails uint64
	first := true
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errPoolClosed
		}
		conns, gen := p.conns, p.gen
		if first {
			startFails, first = p.fails, false
		}
		p.mu.Unlock()

		for _, c := range conns {
			if c.retired.Load() || c.cc.Reserve() != nil {
				continue
			}
			if c.retired.Load() { // see retire: the flag may have been set after the first check
				c.cc.Release()
				continue
			}
			return c, nil
		}

		p.mu.Lock()
		if p.gen != gen {
			p.mu.Unlock()
			continue
		}
		if p.fails != startFails {
			err := p.lastErr
			p.mu.Unlock()
			return nil, err
		}
		if p.wake == nil {
			p.wake = make(chan struct{})
		}
		wake := p.wake
		p.waiting++
		if p.dialing < maxParallelDials && p.dialing*p.perConn < p.waiting {
			p.dialing++
			go p.dialOne()
		}
		p.mu.Unlock()

		select {
		case <-wake:
		case <-ctx.Done():
		}
		p.mu.Lock()
		p.waiting--
		p.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// changedLocked records a state change and wakes every waiter to re-scan.
func (p *pool) changedLocked() {
	p.gen++
	if p.wake != nil {
		close(p.wake)
		p.wake = nil
	}
}

// errDialedAlready: a request's dial came before the start-up check, and is the check.
var errDialedAlready = errors.New("a request dialed first")

// warm dials one connection now and keeps it for the first requests (upcheck.go), unless
// one exists or is being dialed: a second one would be a dial no request uses.
func (p *pool) warm() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errPoolClosed
	}
	if len(p.conns) > 0 || p.dialing > 0 {
		p.mu.Unlock()
		return errDialedAlready
	}
	p.dialing++
	p.mu.Unlock()
	return p.dialOne()
}

// dialOne dials in its own goroutine with its own deadline: the request that triggered
// it may go away, but the others queued behind it still need the connection.
func (p *pool) dialOne() error {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	cc, err := p.dial(ctx)
	cancel()
	p.mu.Lock()
	p.dialing--
	if err != nil {
		p.fails++
		p.lastErr = err
		p.changedLocked()
		p.mu.Unlock()
		return err
	}
	if p.closed {
		p.mu.Unlock()
		cc.Close()
		return errPoolClosed
	}
	// The timer is set before c is published: close and remove read c.timer.
	c := &upConn{cc: cc}
	p.scheduleRetire(c)
	p.conns = append(slices.Clip(p.conns), c)
	p.changedLocked()
	p.mu.Unlock()
	// SetStateHook may run the hook synchronously, so it is called without mu. A change
	// before this point is reported by SetStateHook itself.
	cc.SetStateHook(func(*http.ClientConn) { p.onState(c) })
	return nil
}

// onState runs when c's Available rises, its InFlight falls or it closes.
func (p *pool) onState(c *upConn) {
	if c.cc.Err() != nil {
		p.remove(c)
		return
	}
	if c.retired.Load() {
		if c.cc.InFlight() == 0 {
			c.cc.Close()
		}
		return
	}
	avail := c.cc.Available()
	limit := avail + c.cc.InFlight()
	p.mu.Lock()
	if avail > 0 && limit > 0 {
		p.perConn = limit
	}
	p.changedLocked()
	p.mu.Unlock()
}

// remove drops c from the pool (idempotent) and wakes waiters, who may need a new dial.
func (p *pool) remove(c *upConn) {
	p.mu.Lock()
	if i := slices.Index(p.conns, c); i >= 0 {
		conns := make([]*upConn, 0, len(p.conns)-1)
		conns = append(conns, p.conns[:i]...)
		p.conns = append(conns, p.conns[i+1:]...)
	}
	p.changedLocked()
	p.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
}

// close refuses new requests and closes every connection; called after the drain.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.changedLocked()
	p.mu.Unlock()
	for _, c := range conns {
		c.retired.Store(true)
		if c.timer != nil {
			c.timer.Stop()
		}
		c.cc.Close()
	}
}

// stats reports (connections in the pool, dials in flight) for tests.
func (p *pool) stats() (conns, dialing int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns), p.dialing
}
