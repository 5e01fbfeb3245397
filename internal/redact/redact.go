// Package redact takes secrets out of the strings the agent writes into status: the values of a
// script's Secret-backed variables, and the user:password of any URL (docs/design.md,
// docs/operations/security.md). One function, applied by the agent to every output tail and message it records.
//
// It is pure and knows no source of secrets: the agent hands it the values to hide.
package redact

import (
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Mask stands where a secret was.
const Mask = "[redacted]"

// urlCredentials is the userinfo of a URL, "scheme://user:password@" or "scheme://token@".
var urlCredentials = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#@]+@`)

// Secrets is the set of values one command must not show. The zero value redacts URL
// credentials only; a nil *Secrets does the same.
type Secrets struct {
	mu     sync.Mutex
	values []string // longest first, so a value inside another is not left half-shown
}

// Add records values to redact (nothing on a nil *Secrets). A multi-line value (a key, a certificate) is also redacted line
// by line, as output often shows one line of it.
func (s *Secrets) Add(values ...string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range values {
		s.add(v)
		if strings.Contains(v, "\n") {
			for _, line := range strings.Split(v, "\n") {
				s.add(strings.TrimSpace(line))
			}
		}
	}
	slices.SortFunc(s.values, func(a, b string) int { return len(b) - len(a) })
}

func (s *Secrets) add(v string) {
	if v != "" && !slices.Contains(s.values, v) {
		s.values = append(s.values, v)
	}
}

// String is str with every secret value and every URL's credentials replaced by Mask.
func (s *Secrets) String(str string) string {
	for _, v := range s.snapshot() {
		str = strings.ReplaceAll(str, v, Mask)
	}
	return urlCredentials.ReplaceAllString(str, "${1}"+Mask+"@")
}

// Tail is String for the end of a longer output whose start was cut off: a secret cut in two by
// that cut shows only its end, which String would not find, so that end is masked too.
func (s *Secrets) Tail(str string) string {
	str = s.String(str)
	for _, v := range s.snapshot() {
		for i := 1; i < len(v); i++ {
			if strings.HasPrefix(str, v[i:]) {
				return Mask + str[len(v)-i:]
			}
		}
	}
	return str
}

func (s *Secrets) snapshot() []string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.values)
}

// Error is err with its text redacted, still unwrapping to err (for exit codes and causes).
func (s *Secrets) Error(err error) error {
	if err == nil {
		return nil
	}
	msg := s.String(err.Error())
	if msg == err.Error() {
		return err
	}
	return &redacted{err: err, msg: msg}
}

type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }
