package skeleton

import (
	"context"
	"fmt"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Versions remembers, by object name, which resourceVersions of its objects a controller knows: the
// one it last wrote or read from the API server itself (current) and the one its last status write
// replaced (behind). A controller whose informers lag each other uses it to decide nothing on a
// cached copy older than the API server's, when what it would do on that copy (create a task a
// person deleted, make a silence already made) could not be undone by the status write that follows.
// The zero value is ready to use.
type Versions struct {
	mu    sync.Mutex
	known map[string]versionPair
}

type versionPair struct{ current, replaced string }

// Wrote records that a status write of name replaced the copy at replaced and made the one at current.
func (v *Versions) Wrote(name, current, replaced string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.known == nil {
		v.known = map[string]versionPair{}
	}
	v.known[name] = versionPair{current: current, replaced: replaced}
}

// Forget drops what is known of name, which is gone.
func (v *Versions) Forget(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.known, name)
}

// Behind reports whether cached, a copy from the cache, is older than the API server's. The copy the
// last status write replaced is behind; the one it wrote, or the last read, is current; for any other
// (the first look after a start or a leader change, a person's edit) live, a reader of the API server
// itself, is asked once, into fresh (an empty object of cached's type).
func (v *Versions) Behind(ctx context.Context, live client.Reader, cached, fresh client.Object) (bool, error) {
	name, rv := cached.GetName(), cached.GetResourceVersion()
	v.mu.Lock()
	k := v.known[name]
	v.mu.Unlock()
	switch rv {
	case k.current:
		return false, nil
	case k.replaced:
		return true, nil
	}
	if err := live.Get(ctx, client.ObjectKeyFromObject(cached), fresh); err != nil {
		return false, fmt.Errorf("read %s past the cache: %w", name, err)
	}
	v.Wrote(name, fresh.GetResourceVersion(), k.replaced)
	return fresh.GetResourceVersion() != rv, nil
}
