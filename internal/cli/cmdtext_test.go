package cli

import (
	"reflect"
	"strings"
	"testing"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

// Every kind set on a Command has its own text: none falls through to "no command kind set".
func TestCommandTextForEveryKind(t *testing.T) {
	typ := reflect.TypeFor[nodeopsv1.Command]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() != reflect.Pointer || f.Type.Elem().PkgPath() != typ.PkgPath() {
			continue
		}
		var c nodeopsv1.Command
		reflect.ValueOf(&c).Elem().Field(i).Set(reflect.New(f.Type.Elem()))
		if got := commandText(&c); got == "" || strings.HasPrefix(got, "no command kind set") {
			t.Errorf("%s: commandText = %q", f.Name, got)
		}
	}
}
