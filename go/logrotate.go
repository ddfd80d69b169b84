package main

// logrotate.go owns size rotation of the proxy's log (-log-file) and of the access log
// (-log-max-bytes, -log-backups): before a write would take PATH past max bytes, PATH.1 ...
// PATH.<backups-1> move up one (the oldest, PATH.<backups>, is removed), PATH becomes
// PATH.1 and a new PATH is opened, so the files of one log never hold more than
// max x (backups + 1) bytes. With 0 backups PATH is cut to 0 and started again.
//
// Writes are split at line ends only: a line is never divided between two files (a line
// longer than max alone is cut to max bytes, its newline kept, which only a max below a
// line's length can cause). The size is read from the file (fstat) before each write of
// the proxy's log, which the Go runtime also writes to (panics, fatal errors) through
// stdout and stderr; a write after the last check (a crash's trace) may pass max once.
//
// Must not: lose the file when a rotation step fails (a rename refused in a read-only
// folder falls back to cutting PATH in place, which keeps the bound), or split a line.

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"sync"
)

// rotatingFile is an append-only file rotated by size. Safe for concurrent use.
type rotatingFile struct {
	path    string
	max     int64 // 0: never rotate
	backups int
	// reopened, when set, is called with each new file after a rotation, before the old
	// one is closed (the proxy's log points stdout and stderr at it).
	reopened func(*os.File) error
	// statSize reads the size from the file before each write: other writers share it.
	statSize bool

	mu   sync.Mutex
	f    *os.File
	size int64
}

// openRotating opens path for append (created with mode 0644 if missing). A path that is
// not a regular file is never rotated.
func openRotating(path string, max int64, backups int) (*rotatingFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		// A device or a pipe (/dev/stdout, a FIFO) is written to, never renamed or cut.
		max = 0
	}
	return &rotatingFile{path: path, max: max, backups: backups, f: f, size: st.Size()}, nil
}

// Write appends p, rotating first at each line end where the next line would pass max.
// It reports len(p) written unless the file refused a write.
func (r *rotatingFile) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.max <= 0 {
		n, err := r.f.Write(p)
		r.size += int64(n)
		return n, err
	}
	if r.statSize {
		if st, err := r.f.Stat(); err == nil {
			r.size = st.Size()
		}
	}
	total := len(p)
	for len(p) > 0 {
		room := r.max - r.size
		chunk := fitLines(p, room)
		if chunk == 0 {
			if r.size > 0 {
				if r.rotate() {
					continue
				}
				// Nothing could make room: append rather than lose the lines.
				n, err := r.f.Write(p)
				r.size += int64(n)
				return total - len(p) + n, err
			}
			// One line longer than max into an empty file: cut it to max, newline kept.
			line := p
			if i := bytes.IndexByte(p, '\n'); i >= 0 {
				line = p[:i+1]
			}
			cut := append(append([]byte(nil), line[:r.max-1]...), '\n')
			if r.max == 1 {
				cut = []byte{'\n'}
			}
			if _, err := r.f.Write(cut); err != nil {
				return total - len(p), err
			}
			r.size += int64(len(cut))
			p = p[len(line):]
			continue
		}
		n, err := r.f.Write(p[:chunk])
		r.size += int64(n)
		if err != nil {
			return total - len(p) + n, err
		}
		p = p[chunk:]
	}
	return total, nil
}

// fitLines returns the length of the longest prefix of p made of whole lines (the last
// one may lack its newline when it ends p) that is at most room bytes; 0 if none fits.
func fitLines(p []byte, room int64) int {
	if int64(len(p)) <= room {
		return len(p)
	}
	if room <= 0 {
		return 0
	}
	return bytes.LastIndexByte(p[:room], '\n') + 1
}

// rotate moves the backups up and starts a new PATH; with 0 backups, or when a rename
// fails, it cuts PATH in place instead. It reports whether PATH is empty now. Called with
// mu held.
func (r *rotatingFile) rotate() bool {
	if r.backups > 0 && r.shift() == nil {
		f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, r.mode())
		if err == nil {
			if r.reopened != nil {
				r.reopened(f)
			}
			r.f.Close()
			r.f, r.size = f, 0
			return true
		}
		// PATH.1 is the file still open: take its name back and cut it below.
		os.Rename(r.backupName(1), r.path)
	}
	// O_APPEND: the next write lands at the new end, 0, for every descriptor of the file
	// (stdout and stderr share the open file with r.f).
	if r.f.Truncate(0) == nil {
		r.size = 0
		return true
	}
	return false
}

// shift renames PATH.<i> to PATH.<i+1> from the oldest down (removing PATH.<backups>) and
// PATH to PATH.1. A missing backup is no error: a young log has fewer.
func (r *rotatingFile) shift() error {
	if err := os.Remove(r.backupName(r.backups)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for i := r.backups - 1; i >= 1; i-- {
		if err := os.Rename(r.backupName(i), r.backupName(i+1)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return os.Rename(r.path, r.backupName(1))
}

func (r *rotatingFile) backupName(i int) string { return r.path + "." + strconv.Itoa(i) }

// mode is the current file's permission bits, so a new PATH keeps what its creator (the
// launcher, for the proxy's log) chose.
func (r *rotatingFile) mode() os.FileMode {
	if st, err := r.f.Stat(); err == nil {
		return st.Mode().Perm()
	}
	return 0o644
}

// file is the open file (the proxy's log points stdout and stderr at it).
func (r *rotatingFile) file() *os.File {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.f
}

func (r *rotatingFile) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.f.Close()
}
