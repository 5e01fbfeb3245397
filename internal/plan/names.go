package plan

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// hashLen is how many hex digits of sha256 a shortened name keeps: 64 bits, collisions negligible.
const hashLen = 16

// TaskName is the deterministic name of the NodeTask that runs group's commands on node for owner
// (an operation or profile name): "<owner>-<group>-<node>", or, when that is longer than 253
// characters or not a DNS-1123 subdomain, a sanitized prefix of it followed by a hash of the three parts.
func TaskName(owner, group, node string) string {
	name := owner + "-" + group + "-" + node
	if len(name) <= validation.DNS1123SubdomainMaxLength && len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	return shorten(name, hashOf(owner, group, node), validation.DNS1123SubdomainMaxLength, isSubdomainChar)
}

// LabelValue returns s when it is a valid label value, else a sanitized prefix of s followed by a
// hash of s, so that names longer than 63 characters (nodes, operations) can still be selected by label.
func LabelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 {
		return s
	}
	return shorten(s, hashOf(s), validation.LabelValueMaxLength, isLabelValueChar)
}

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:hashLen]
}

// shorten keeps the longest readable prefix of s that, with "-"+hash appended, fits max and keeps to
// the allowed characters; the hash alone when nothing readable is left.
func shorten(s, hash string, maxLen int, allowed func(rune) bool) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if allowed(r) {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	prefix := b.String()
	if limit := maxLen - len(hash) - 1; len(prefix) > limit {
		prefix = prefix[:limit]
	}
	// Both formats must start and end with an alphanumeric character, and a subdomain's labels
	// may not begin or end with '-', so trim everything else from both ends.
	prefix = strings.TrimFunc(prefix, func(r rune) bool { return !isAlnum(r) })
	for strings.Contains(prefix, ".-") || strings.Contains(prefix, "-.") || strings.Contains(prefix, "..") {
		prefix = strings.NewReplacer(".-", "-", "-.", "-", "..", ".").Replace(prefix)
	}
	if prefix == "" {
		return hash
	}
	return prefix + "-" + hash
}

func isAlnum(r rune) bool { return (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') }

func isSubdomainChar(r rune) bool { return isAlnum(r) || r == '-' || r == '.' }

func isLabelValueChar(r rune) bool { return isAlnum(r) || r == '-' || r == '.' || r == '_' }
