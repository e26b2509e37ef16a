package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/signals"
)

// maxEndpoints bounds the replicas a source may list.
const maxEndpoints = 4096

// maxFileBytes bounds the endpoints file: 4096 lines of 2 KiB, ample for
// addresses and their comments.
const maxFileBytes = maxEndpoints << 11

// byteOrderMark is the UTF-8 byte-order mark.
const byteOrderMark = "\xef\xbb\xbf"

// replica is an endpoint named by the address the data plane dials,
// "ip:port", which is what the endpoint picker protocol returns.
type replica string

func (r replica) Key() string { return string(r) }

// checkAddr reports whether a is a "host:port" address: an IP address (an
// IPv6 one in brackets) or a DNS name, and a numeric port. The address is
// what the data plane receives as the destination, so nothing else may pass.
func checkAddr(a string) error {
	if a == "" {
		return errors.New("an empty address")
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q: want host:port: %w", a, err)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", a)
	}
	if !validHost(host) {
		return fmt.Errorf("%q: the host is neither an IP address nor a DNS name", a)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return fmt.Errorf("%q has no valid port", a)
	}
	return nil
}

// checkReplica reports whether a is a replica's address: an IP address
// without a zone and a port, written as netip.AddrPort writes it (an IPv6
// address in brackets and its shortest lowercase form, no IPv4 in brackets
// or mapped into IPv6, the port in decimal without sign or leading zeros).
// The endpoint picker protocol returns ip:port, and the data plane parses
// and dials it as given (Envoy's original-destination routing takes no
// names and reads anything in brackets as IPv6); and the address is the
// replica's key, so one replica written two ways would be two.
func checkReplica(a string) error {
	if err := checkAddr(a); err != nil {
		return err
	}
	ap, err := netip.ParseAddrPort(a)
	if err != nil {
		host, _, _ := net.SplitHostPort(a)
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("%q: the data plane dials the address as given, so the host must be an IP address; to follow a DNS name, use -dns NAME:PORT instead", a)
		}
		return fmt.Errorf("%q: want ip:port, such as 10.0.0.7:8000 or [fd00::7]:8000", a)
	}
	switch ip := ap.Addr(); {
	case ip.Zone() != "":
		return fmt.Errorf("%q: an address with a zone cannot be returned to the data plane", a)
	case ip.Is4In6():
		return fmt.Errorf("%q: write the IPv4 address as such: %s", a, netip.AddrPortFrom(ip.Unmap(), ap.Port()))
	case ap.Port() == 0:
		return fmt.Errorf("%q has no valid port", a)
	case ap.String() != a:
		return fmt.Errorf("%q: write it %s, so that one replica has one key", a, ap)
	}
	return nil
}

// validHost reports whether h is an IP address or a DNS name: dot-separated
// labels of at most 63 letters, digits, '-' or '_', 253 bytes in all.
func validHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	name := strings.TrimSuffix(h, ".")
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// readFile returns the contents of the regular file at path, or an error if
// it holds more than limit bytes: a file that is not an endpoints list (a
// log) must not take the picker's memory. Anything but a regular file is
// refused before it is read: a device may never end, and opening or reading
// a named pipe (what a shell's process substitution passes) waits for a
// writer that may never come, which no context cancels.
func readFile(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%v)", path, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return data, nil
}

// resolver looks up a host's addresses; *net.Resolver is one.
type resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// source lists the replicas: from flags, a file or DNS.
type source struct {
	static []string
	file   string
	dns    string // name:port
	res    resolver
}

// load returns the replicas' addresses, sorted and without duplicates.
func (s source) load(ctx context.Context) ([]string, error) {
	var addrs []string
	switch {
	case s.file != "":
		data, err := readFile(s.file, maxFileBytes)
		if err != nil {
			return nil, err
		}
		// A byte-order mark, which some editors write, is not part of
		// the first address.
		data = bytes.TrimPrefix(data, []byte(byteOrderMark))
		sc := bufio.NewScanner(bytes.NewReader(data))
		for line := 1; sc.Scan(); line++ {
			l := strings.TrimSpace(sc.Text())
			if i := strings.IndexByte(l, '#'); i >= 0 {
				l = strings.TrimSpace(l[:i])
			}
			if l == "" {
				continue
			}
			if err := checkReplica(l); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", s.file, line, err)
			}
			addrs = append(addrs, l)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", s.file, err)
		}
	case s.dns != "":
		host, port, err := net.SplitHostPort(s.dns)
		if err != nil {
			return nil, err
		}
		ips, err := s.res.LookupHost(ctx, host)
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return []string{}, nil // a headless Service with no ready pods has no records
		}
		if err != nil {
			return nil, err
		}
		for _, ip := range oneFamily(ips) {
			a := net.JoinHostPort(ip, port)
			if err := checkReplica(a); err != nil {
				return nil, fmt.Errorf("-dns %s: %w", s.dns, err)
			}
			addrs = append(addrs, a)
		}
	default:
		for i, a := range s.static {
			if err := checkReplica(a); err != nil {
				return nil, fmt.Errorf("-endpoints entry %d: %w", i+1, err)
			}
			addrs = append(addrs, a)
		}
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	if len(addrs) > maxEndpoints {
		return nil, fmt.Errorf("%d replicas listed, more than %d", len(addrs), maxEndpoints)
	}
	return addrs, nil
}

// oneFamily returns the IPv4 addresses of ips if it has any, else ips. A
// dual-stack headless Service answers with an A and an AAAA record for each
// pod: both would make every pod two replicas, each with half its load and
// half its cached prefixes.
func oneFamily(ips []string) []string {
	v4 := make([]string, 0, len(ips))
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil && a.Unmap().Is4() {
			v4 = append(v4, ip)
		}
	}
	if len(v4) == 0 {
		return ips
	}
	return v4
}

// membership applies the replicas a source lists to the balancer, the
// scraper and the KV-event subscriber, and has the replicas that left
// forgotten as asleep.
type membership struct {
	src      source
	b        *llmlb.Balancer
	scraper  *signals.Scraper     // nil: no scraping
	sleep    *sleeping            // nil: no scraping
	sub      *kvevents.Subscriber // nil: no KV events
	scheme   string               // of the metrics URLs
	path     string
	kvPort   int
	kvReplay int
	kvTopic  string
	salt     prefix.Salt
	log      *slog.Logger
	ready    func() // called after the first successful load

	mu        sync.Mutex // protects the fields below
	current   []string
	pending   []string // a changed file not yet read twice alike; nil: none
	loaded    time.Time
	lastErr   error
	synced    bool
	noRecords bool // the last lookup of the -dns name found no records
}

// refresh loads the source and applies a changed membership. A failed load
// keeps the current membership. A file that changed after the first load is
// applied once two reads in a row agree, so that a file caught half written
// (rewritten in place rather than replaced by a rename) is skipped; so is a
// name that stops resolving, so that one lookup answered "no such host" in
// a DNS blip does not empty the pool.
func (m *membership) refresh(ctx context.Context) error {
	addrs, err := m.src.load(ctx)
	if err == nil && m.src.dns != "" {
		m.noteRecords(len(addrs) > 0)
	}
	if err == nil {
		switch {
		case m.src.file != "", m.src.dns != "" && len(addrs) == 0:
			addrs, err = m.settle(addrs)
		case m.src.dns != "":
			m.mu.Lock()
			m.pending = nil
			m.mu.Unlock()
		}
	}
	if err == nil && addrs != nil {
		err = m.apply(addrs)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastErr = err
	if err != nil {
		return err
	}
	m.loaded = time.Now()
	if !m.synced {
		m.synced = true
		if m.ready != nil {
			m.ready()
		}
	}
	return nil
}

// noteRecords logs when the -dns name stops or starts having records. A
// name without records is no error, as a headless Service with no ready pod
// has none, but a picker that routes nothing must say why: the name may be
// misspelt.
func (m *membership) noteRecords(has bool) {
	m.mu.Lock()
	changed := m.noRecords == has
	m.noRecords = !has
	m.mu.Unlock()
	switch {
	case changed && !has:
		m.log.Warn("llmlb-epp: the -dns name has no records (a misspelt name, or a headless Service with no ready pod)",
			"name", m.src.dns)
	case changed && has:
		m.log.Info("llmlb-epp: the -dns name has records again", "name", m.src.dns)
	}
}

// settle returns the file's addresses to apply: addrs if they are those of
// the previous read (or of the first), else nil, keeping them to compare with
// the next read.
func (m *membership) settle(addrs []string) ([]string, error) {
	if addrs == nil {
		addrs = []string{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !m.synced, slices.Equal(addrs, m.current):
		m.pending = nil
		return addrs, nil
	case m.pending != nil && slices.Equal(addrs, m.pending):
		m.pending = nil
		return addrs, nil
	}
	m.pending = addrs
	return nil, nil
}

func (m *membership) apply(addrs []string) error {
	m.mu.Lock()
	same := m.synced && slices.Equal(addrs, m.current)
	prev := len(m.current)
	m.mu.Unlock()
	if same {
		return nil
	}
	eps := make([]llmlb.Endpoint, len(addrs))
	targets := make(map[string]string, len(addrs))
	kv := make(map[string]kvevents.Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = replica(a)
		targets[a] = m.scheme + "://" + a + m.path
		if m.sub != nil {
			host, _, _ := net.SplitHostPort(a)
			ep := kvevents.Endpoint{PubAddr: "tcp://" + net.JoinHostPort(host, strconv.Itoa(m.kvPort)), Topic: m.kvTopic, Salt: m.salt}
			if m.kvReplay != 0 {
				ep.ReplayAddr = "tcp://" + net.JoinHostPort(host, strconv.Itoa(m.kvReplay))
			}
			kv[a] = ep
		}
	}
	if m.scraper != nil {
		if err := m.scraper.SetTargets(targets); err != nil {
			return err
		}
	}
	if m.sub != nil {
		if err := m.sub.SetEndpoints(kv); err != nil {
			return err
		}
	}
	if err := m.b.Update(eps); err != nil {
		return err
	}
	if m.sleep != nil {
		m.sleep.retain(targets)
	}
	m.mu.Lock()
	m.current = addrs
	m.mu.Unlock()
	m.log.Info("llmlb-epp: replicas updated", "replicas", len(addrs), "before", prev)
	return nil
}

// watch refreshes the membership every interval until ctx ends; a file or
// DNS source changes, a static one does not. failing is the number of reads
// that failed in a row before it, already logged: a failure is logged the
// first time in a row and then every hundredth, and the recovery once.
func (m *membership) watch(ctx context.Context, every time.Duration, failing int) {
	if m.src.file == "" && m.src.dns == "" {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.refresh(ctx); err != nil {
			failing++
			if failing == 1 || failing%100 == 0 {
				m.log.Warn("llmlb-epp: reading the replicas failed; keeping the last ones", "error", err, "consecutive_failures", failing)
			}
			continue
		}
		if failing > 0 {
			m.log.Info("llmlb-epp: reading the replicas recovered", "failures", failing)
		}
		failing = 0
	}
}

// sourceStatus is what the debug view shows of the replicas' source.
type sourceStatus struct {
	replicas []string
	loaded   time.Time // the last successful read; zero before the first
	err      error     // of the last read
	synced   bool      // a read succeeded
}

// status returns the source's status.
func (m *membership) status() sourceStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	return sourceStatus{replicas: slices.Clone(m.current), loaded: m.loaded, err: m.lastErr, synced: m.synced}
}
