package objname

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// hashLen is how many hex digits of sha256 a shortened name keeps: 64 bits, collisions negligible.
const hashLen = 16

// TaskName is the deterministic name of the NodeTask that runs group's commands on node for owner
// (an operation or profile name). Distinct triples always get distinct names:
//
//   - "<owner>-<group>-<node>" when owner and group hold no '-', so the first two dashes split the
//     name back into its parts; a name such as upgrade-workers-worker-1 stays as it was.
//   - otherwise a readable prefix of the same join (sanitized, shortened to fit 253 characters) and
//     "-" and a hash of the three parts, as ("a-b", "c", "n") and ("a", "b-c", "n") join alike.
//
// A plain name never ends in "-" and hashLen hex digits (such a node's task is hashed instead), so a
// plain name never equals a hashed one; two hashed names are equal only if the hashes collide.
func TaskName(owner, group, node string) string {
	name := owner + "-" + group + "-" + node
	if !strings.Contains(owner, "-") && !strings.Contains(group, "-") && plainSubdomain(name) {
		return name
	}
	return shorten(name, hashOf(owner, group, node), validation.DNS1123SubdomainMaxLength, isSubdomainChar)
}

// NodeLeaseName is the name of the coordination.k8s.io Lease that says which NodeTask executes on
// node (exclusion that cannot be bypassed, rule 8): "node-<node>", or, when that is too long or ends like a hash,
// a readable prefix and a hash of the node name, as TaskName shortens.
func NodeLeaseName(node string) string {
	name := "node-" + node
	if plainSubdomain(name) {
		return name
	}
	return shorten(name, hashOf(node), validation.DNS1123SubdomainMaxLength, isSubdomainChar)
}

func plainSubdomain(s string) bool {
	return len(s) <= validation.DNS1123SubdomainMaxLength && len(validation.IsDNS1123Subdomain(s)) == 0 && !endsInHash(s)
}

// LabelValue returns s when it is a valid label value, else a sanitized prefix of s followed by a
// hash of s, so that names longer than 63 characters (nodes, operations) can still be selected by label.
// As in TaskName, a value that already ends like a hash is hashed too, so distinct values never share one.
func LabelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 && !endsInHash(s) {
		return s
	}
	return shorten(s, hashOf(s), validation.LabelValueMaxLength, isLabelValueChar)
}

// hashOf is Hash cut to the hashLen digits names carry.
func hashOf(parts ...string) string { return Hash(parts...)[:hashLen] }

// Hash is the hex SHA-256 of the parts length-prefixed, so no choice of parts can imitate another.
func Hash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// endsInHash reports whether s ends as shorten's results do: "-" and hashLen lowercase hex digits,
// or is hashLen hex digits alone (shorten's result when nothing readable is left).
func endsInHash(s string) bool {
	if len(s) < hashLen || (len(s) > hashLen && s[len(s)-hashLen-1] != '-') {
		return false
	}
	for _, r := range s[len(s)-hashLen:] {
		if !(r >= '0' && r <= '9') && !(r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
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

// InstallerPodName is the name of the pod a pod command runs on node: one name per node, since a node
// runs one task at a time (safety rule 1) and so one pod command. Admission lets a node's agent
// create a pod of this name only (config/admission), so no agent can take another node's pod name,
// and none holds more than one pod. A restarted agent finds its pod by it.
func InstallerPodName(node string) string { return "installer-" + node }

func isLabelChar(r rune) bool { return isAlnum(r) || r == '-' }

// SecretHolderPodName is the name of the pod that holds task's Secrets on its node while it runs
// (internal/secretholder): a readable prefix of "secrets-<task>" and a hash of the task, a DNS label,
// so the manager and the task's agent find the one pod by name.
func SecretHolderPodName(task string) string {
	return shorten("secrets-"+task, hashOf("secrets", task), validation.DNS1123LabelMaxLength, isLabelChar)
}

// SecretVolumeName is the name of the holder pod's volume of the Secret named secret (a DNS
// subdomain, which a volume name, a DNS label, may not be): the name itself when it is a plain DNS
// label, else a readable prefix and a hash of it.
func SecretVolumeName(secret string) string {
	if len(validation.IsDNS1123Label(secret)) == 0 && !endsInHash(secret) {
		return secret
	}
	return shorten(secret, hashOf(secret), validation.DNS1123LabelMaxLength, isLabelChar)
}
