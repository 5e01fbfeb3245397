package testutil

import (
	"context"
	"reflect"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StaleGet is a client (a manager's cache, in the tests of a look on a copy behind the API
// server) that returns Stale, as it was, for a Get of Stale's kind and name; every other read and
// every write goes to Client.
type StaleGet struct {
	client.Client
	Stale client.Object
}

func (c StaleGet) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if reflect.TypeOf(obj) == reflect.TypeOf(c.Stale) && key.Name == c.Stale.GetName() && key.Namespace == c.Stale.GetNamespace() {
		reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(c.Stale.DeepCopyObject()).Elem())
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}
