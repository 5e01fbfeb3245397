package main

import (
	"reflect"
	"testing"
)

func TestParseReadsUnitsAsSystemctlDoes(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		verb  string
		units []string
		quiet bool
	}{
		{[]string{"restart", "kubelet.service"}, "restart", []string{"kubelet"}, false},
		// nodeops' agent: `systemctl restart -- UNIT`, so that a unit is never read as an option.
		{[]string{"restart", "--", "kubelet.service"}, "restart", []string{"kubelet"}, false},
		{[]string{"restart", "--", "-x.service"}, "restart", []string{"-x"}, false},
		{[]string{"is-active", "-q", "containerd"}, "is-active", []string{"containerd"}, true},
		{[]string{"--no-pager", "status", "kubelet"}, "status", []string{"kubelet"}, false},
	} {
		verb, units, quiet := parse(tc.args)
		if verb != tc.verb || !reflect.DeepEqual(units, tc.units) || quiet != tc.quiet {
			t.Errorf("parse(%q) = %q %q %v, want %q %q %v", tc.args, verb, units, quiet, tc.verb, tc.units, tc.quiet)
		}
	}
}
