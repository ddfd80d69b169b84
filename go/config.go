package main

import (
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// maxPingInterval is AWS Global Accelerator's idle limit: a connection that carries no
// application data for this long is dropped, so PINGs must come strictly more often.
// sidecar_fsm/config.py holds the same limit and duration rules (the launcher refuses a
// config before any process exists); tests/integration/test_config_agrees_with_proxy.py
// reads this binary's -h and limits and fails when the two differ.
const maxPingInterval = 340 * time.Second

// Config is the validated command line. Nothing is bound or dialled before parseConfig
// returns it, so a bad flag never leaves a socket or a ready file behind.
type Config struct {
	// Listen is the loopback address clients use (-listen, default 127.0.0.1:1250).
	// Port 0 binds a free port; the ready file tells which.
	Listen string

	// Upstream is the origin https://host[:port] with userinfo, path and query removed
	// (-upstream, required). A path or query is refused rather than silently prepended.
	Upstream *url.URL
	// UpstreamAddr is Upstream's host:port with the default port 443 filled in.
	UpstreamAddr string
	// ServerName is the TLS server name and the :authority the upstream sees.
	ServerName string
	// Egress is the HTTP proxy the upstream is reached through (CONNECT tunnel), as
	// net/http's ProxyFromEnvironment decides from HTTPS_PROXY/https_proxy and
	// NO_PROXY/no_proxy; nil dials the upstream directly (no variable, NO_PROXY matches,
	// or the upstream is localhost or a loopback address). Not a flag: the variables are
	// the site's, and every Go program honours them.
	Egress *egressProxy

	// PingInterval is the read-idle time after which a PING is sent on an upstream
	// connection (-ping-interval, default 60s). Must be above 0 and below 340s.
	PingInterval time.Duration
	// PingTimeout closes an upstream connection whose PING is not acknowledged in time
	// (-ping-timeout, default 15s). Must be above 0.
	PingTimeout time.Duration
	// ShutdownGrace bounds the drain after SIGTERM/SIGINT (-shutdown-grace, default 15m).
	// Zero ends in-flight requests at once.
	ShutdownGrace time.Duration
	// RetryBodyLimit is the largest request body buffered so that a request refused by a
	// graceful GOAWAY can be re-sent (-retry-body-limit, default 16 MiB). Larger bodies
	// stream and are not retried; zero disables buffering (bodiless requests still retry).
	RetryBodyLimit int64
	// MaxConnAge moves new requests to a fresh upstream connection after 90-100 % of it
	// (-max-conn-age, default 50m). Zero never rotates.
	MaxConnAge time.Duration

	// ReadyFile, when set, receives {"pid": N, "listen": "host:port"} once bound.
	ReadyFile string
	// InsecureSkipVerify skips upstream certificate checks (tests only).
	InsecureSkipVerify bool
	// CAFile names extra PEM roots for the upstream; CAPEM holds its validated content.
	CAFile string
	CAPEM  []byte
	// ExitWithPID drains and exits when that process is gone (0 = off).
	ExitWithPID int
	// MetricsListen is the loopback host:port of GET /metrics (-metrics-listen, default
	// "" = off). Port 0 binds a free port; the ready file tells which.
	MetricsListen string
	// Pprof serves the runtime's profiles on the metrics listener (-pprof, pprof.go).
	Pprof bool

	// The traffic record, access log and log rotation (traffic.go, accesslog.go,
	// logrotate.go) are the flags of outputs.go.
	Outputs
	// NVCF is NVIDIA Cloud Functions' 202 protocol, the flags of nvcf.go.
	NVCF NVCF
}

// usageError is a bad flag or environment: the caller prints it as one line and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func badFlag(name, value, format string, args ...any) error {
	return &usageError{fmt.Sprintf("-%s %q: %s", name, value, fmt.Sprintf(format, args...))}
}

// parseConfig parses and validates args. getenv is os.Getenv outside tests. It returns
// flag.ErrHelp for -h after writing the usage to usage.
func parseConfig(args []string, getenv func(string) string, usage io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("h2-ping-sidecar", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", "127.0.0.1:1250", "`host:port` to serve HTTP/1.1 on (port 0 = any free port)")
	upstream := fs.String("upstream", "", "upstream origin `https://host[:port]` (required; no path or query)")
	pingInterval := fs.String("ping-interval", "60s", "send a PING after this read-idle `duration` (> 0, < 340s)")
	pingTimeout := fs.String("ping-timeout", "15s", "close a connection whose PING is unanswered for this `duration` (> 0)")
	shutdownGrace := fs.String("shutdown-grace", "15m", "drain in-flight requests for up to this `duration` on SIGTERM (>= 0)")
	retryBodyLimit := fs.String("retry-body-limit", "16777216", "buffer request bodies up to this many `bytes` for GOAWAY re-send (>= 0; 0 = never)")
	maxConnAge := fs.String("max-conn-age", "50m", "move new requests to a fresh connection after 90-100% of this `duration` (0 = off)")
	readyFile := fs.String("ready-file", "", "write {\"pid\",\"listen\"} JSON to this `path` once bound")
	insecure := fs.Bool("insecure-skip-verify", false, "skip upstream certificate verification (tests only)")
	caFile := fs.String("ca-file", "", "extra PEM root certificates for the upstream (`path`)")
	exitWithPID := fs.String("exit-with-pid", "0", "drain and exit when the process with this `pid` is gone (0 = off)")
	metricsListen := fs.String("metrics-listen", "", "serve GET /metrics (Prometheus text) on this loopback `host:port` (port 0 = any free port; default off)")
	profiling := fs.Bool("pprof", false, "also serve Go's profiles at /debug/pprof/NAME on -metrics-listen (for leak hunts; default off)")
	outputs := defineOutputFlags(fs)
	nvcf := defineNVCFFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(usage)
			fmt.Fprintln(usage, "usage: h2-ping-sidecar -upstream https://host[:port] [flags]")
			fs.PrintDefaults()
			fmt.Fprintln(usage, "environment: HTTPS_PROXY (or https_proxy) names an HTTP egress proxy for the upstream\n"+
				"  (CONNECT tunnel; NO_PROXY or no_proxy exempts hosts), as for any Go program")
			return nil, flag.ErrHelp
		}
		return nil, &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{fmt.Sprintf("argument %q: unexpected; all options are flags", fs.Arg(0))}
	}
	if err := checkGODEBUG(getenv("GODEBUG")); err != nil {
		return nil, err
	}

	cfg := &Config{ReadyFile: *readyFile, InsecureSkipVerify: *insecure, CAFile: *caFile}
	var err error
	if cfg.Listen, err = validateListen(*listen); err != nil {
		return nil, err
	}
	if cfg.Upstream, cfg.UpstreamAddr, cfg.ServerName, err = validateUpstream(*upstream); err != nil {
		return nil, err
	}
	if cfg.Egress, err = egressFromEnvironment(cfg.Upstream, getenv); err != nil {
		return nil, err
	}
	if cfg.PingInterval, err = parseDuration("ping-interval", *pingInterval); err != nil {
		return nil, err
	}
	if cfg.PingInterval <= 0 || cfg.PingInterval >= maxPingInterval {
		return nil, badFlag("ping-interval", *pingInterval, "must be above 0 and below 340s; try 60s")
	}
	if cfg.PingTimeout, err = parseDuration("ping-timeout", *pingTimeout); err != nil {
		return nil, err
	}
	if cfg.PingTimeout <= 0 {
		return nil, badFlag("ping-timeout", *pingTimeout, "must be above 0; try 15s")
	}
	if cfg.ShutdownGrace, err = parseDuration("shutdown-grace", *shutdownGrace); err != nil {
		return nil, err
	}
	if cfg.ShutdownGrace < 0 {
		return nil, badFlag("shutdown-grace", *shutdownGrace, "must not be negative; use 0 to stop at once")
	}
	if cfg.MaxConnAge, err = parseDuration("max-conn-age", *maxConnAge); err != nil {
		return nil, err
	}
	if cfg.MaxConnAge < 0 {
		return nil, badFlag("max-conn-age", *maxConnAge, "must not be negative; use 0 to turn rotation off")
	}
	cfg.RetryBodyLimit, err = strconv.ParseInt(*retryBodyLimit, 10, 64)
	if err != nil || cfg.RetryBodyLimit < 0 {
		return nil, badFlag("retry-body-limit", *retryBodyLimit, "must be a whole number of bytes >= 0; use 0 to never buffer")
	}
	pid, err := strconv.Atoi(*exitWithPID)
	if err != nil || pid < 0 {
		return nil, badFlag("exit-with-pid", *exitWithPID, "must be a process id above 0, or 0 for off")
	}
	cfg.ExitWithPID = pid
	if *metricsListen != "" {
		if cfg.MetricsListen, err = validateMetricsListen(*metricsListen); err != nil {
			return nil, err
		}
	}
	if cfg.Pprof = *profiling; cfg.Pprof && cfg.MetricsListen == "" {
		return nil, badFlag("pprof", "true", "needs -metrics-listen, the listener it is served on")
	}
	if cfg.Outputs, err = outputs.validate(); err != nil {
		return nil, err
	}
	if cfg.NVCF, err = nvcf.validate(cfg.Upstream, getenv); err != nil {
		return nil, err
	}
	if cfg.CAFile != "" {
		if cfg.CAPEM, err = readCAFile(cfg.CAFile); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// checkGODEBUG refuses http2debug in any form: net/http then logs every HTTP/2 frame,
// request headers (Authorization) included, which this proxy promises never to do.
func checkGODEBUG(godebug string) error {
	for _, kv := range strings.Split(godebug, ",") {
		if strings.HasPrefix(strings.TrimSpace(kv), "http2debug") {
			return &usageError{fmt.Sprintf("GODEBUG %q: http2debug makes net/http log request headers; remove it", godebug)}
		}
	}
	return nil
}

func parseDuration(name, value string) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	if err != nil {
		return 0, badFlag(name, value, "not a duration; use Go syntax such as 60s or 1m30s")
	}
	return d, nil
}

func validateListen(value string) (string, error) {
	_, port, err := net.SplitHostPort(value)
	if err != nil {
		return "", badFlag("listen", value, "must be host:port, e.g. 127.0.0.1:1250")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", badFlag("listen", value, "port must be 0-65535 (0 = any free port)")
	}
	return value, nil
}

// validateMetricsListen accepts a loopback host:port only: the metrics name no request,
// but they tell anyone who can connect how busy the job is and whether its upstream works.
func validateMetricsListen(value string) (string, error) {
	host, port, err := net.SplitHostPort(value)
	if err != nil {
		return "", badFlag("metrics-listen", value, "must be host:port, e.g. 127.0.0.1:0")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", badFlag("metrics-listen", value, "port must be 0-65535 (0 = any free port)")
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", badFlag("metrics-listen", value, "is not loopback; use 127.0.0.1:PORT (port 0 = any free port)")
	}
	return value, nil
}

// validateUpstream returns the origin (userinfo dropped: it is never sent nor logged), the
// address to dial and the TLS server name.
func validateUpstream(value string) (*url.URL, string, string, error) {
	if value == "" {
		return nil, "", "", badFlag("upstream", value, "is required; give https://host[:port]")
	}
	u, err := url.Parse(value)
	if err != nil {
		return nil, "", "", badFlag("upstream", redactURL(value), "not a URL; give https://host[:port]")
	}
	shown := redactURL(value)
	if u.Scheme != "https" {
		return nil, "", "", badFlag("upstream", shown, "must be https:// (HTTP/2 is chosen by ALPN)")
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "" {
		return nil, "", "", badFlag("upstream", shown, "has a path or query; give only https://host[:port] (client paths are kept)")
	}
	host := u.Hostname()
	if host == "" {
		return nil, "", "", badFlag("upstream", shown, "has no host; give https://host[:port]")
	}
	port := u.Port()
	if port == "" {
		port = "443"
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, "", "", badFlag("upstream", shown, "port must be 1-65535")
	}
	origin := &url.URL{Scheme: "https", Host: u.Host}
	return origin, net.JoinHostPort(host, port), host, nil
}

// redactURL drops userinfo so a credential in -upstream never reaches a log line.
func redactURL(value string) string {
	u, err := url.Parse(value)
	if err != nil {
		if i := strings.LastIndex(value, "@"); i >= 0 {
			return "<redacted>@" + value[i+1:]
		}
		return value
	}
	u.User = nil
	return u.String()
}

// readCAFile reads and checks -ca-file now, before binding, so a typo fails fast. The
// system roots are merged in at the first dial (transport.go), off the start-up path.
func readCAFile(path string) ([]byte, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, badFlag("ca-file", path, "cannot be read (%v); give a readable PEM file", unwrapPathError(err))
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return nil, badFlag("ca-file", path, "holds no PEM certificate; give a PEM file with CA certificates")
	}
	return pem, nil
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
