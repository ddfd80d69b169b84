package main

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// serveGoaway serves every accepted TLS connection with its own http.Server, and shuts that
// server down once its connection has received `every` requests. net/http does not export
// the HTTP/2 server connection, but Server.Shutdown makes it send a graceful GOAWAY (error
// code NO_ERROR, last stream ID = the highest stream it has seen): requests already received
// finish, later streams are refused and the client must re-send them on a new connection,
// which is what a load balancer draining a connection does. The connection closes one second
// after its last stream ends (net/http's goAwayTimeout).
func serveGoaway(l net.Listener, newServer func() *http.Server, every int, st *stats) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		srv := newServer()
		var once sync.Once
		cs := &connState{}
		cs.onRequest = func(n int64) {
			if n < int64(every) {
				return
			}
			once.Do(func() {
				st.goaways.Add(1)
				// Shutdown blocks until the connection is gone; the handler that triggered it
				// is one of the requests it waits for, so it must not run on this goroutine.
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
					defer cancel()
					_ = srv.Shutdown(ctx)
				}()
			})
		}
		srv.BaseContext = func(net.Listener) context.Context {
			return context.WithValue(context.Background(), connKey{}, cs)
		}
		go func() { _ = srv.Serve(newOneConnListener(c)) }()
	}
}

// oneConnListener yields one connection, then blocks in Accept until closed, so that
// Server.Serve keeps running (and Shutdown has a listener to close) while the connection lives.
type oneConnListener struct {
	conn   net.Conn
	mu     sync.Mutex
	given  bool
	closed chan struct{}
	once   sync.Once
}

func newOneConnListener(c net.Conn) *oneConnListener {
	return &oneConnListener{conn: c, closed: make(chan struct{})}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.given {
		l.given = true
		l.mu.Unlock()
		return l.conn, nil
	}
	l.mu.Unlock()
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }
