package plan

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestUpgradeSteps(t *testing.T) {
	tests := []struct {
		name, current, target string
		path                  []string
		want                  []string
		refused, bad          bool
	}{
		{name: "up to date", current: "v1.37.2", target: "v1.37.2"},
		{name: "patch", current: "v1.37.0", target: "v1.37.2", want: []string{"v1.37.2"}},
		{name: "next minor", current: "v1.36.3", target: "v1.37.2", want: []string{"v1.37.2"}},
		{name: "two minors with a path", current: "v1.35.3", target: "v1.37.2", path: []string{"v1.36.4"}, want: []string{"v1.36.4", "v1.37.2"}},
		{name: "passed path entries ignored", current: "v1.36.4", target: "v1.37.2", path: []string{"v1.35.9", "v1.36.4"}, want: []string{"v1.37.2"}},
		{name: "three minors", current: "v1.34.1", target: "v1.37.2", path: []string{"v1.36.4", "v1.35.7"}, want: []string{"v1.35.7", "v1.36.4", "v1.37.2"}},
		{name: "skipped minor without a path", current: "v1.35.3", target: "v1.37.2", refused: true},
		{name: "path names a minor twice", current: "v1.35.3", target: "v1.37.2", path: []string{"v1.36.4", "v1.36.5"}, refused: true},
		{name: "downgrade", current: "v1.37.2", target: "v1.36.9", refused: true},
		{name: "patch downgrade", current: "v1.37.2", target: "v1.37.1", refused: true},
		{name: "major", current: "v1.37.2", target: "v2.0.0", refused: true},
		{name: "malformed target", current: "v1.37.2", target: "v1.x", bad: true},
		{name: "malformed current", current: "", target: "v1.37.2", bad: true},
		{name: "malformed path", current: "v1.35.3", target: "v1.37.2", path: []string{"latest"}, bad: true},
	}
	for _, tt := range tests {
		got, err := UpgradeSteps(tt.current, tt.target, tt.path)
		var skew *VersionSkewError
		switch {
		case tt.refused:
			if !errors.As(err, &skew) || !strings.Contains(err.Error(), tt.current) || !strings.Contains(err.Error(), tt.target) {
				t.Errorf("%s: got %v, %v; want a VersionSkewError naming both versions", tt.name, got, err)
			}
		case tt.bad:
			if err == nil || errors.As(err, &skew) {
				t.Errorf("%s: got %v, %v; want a parse error", tt.name, got, err)
			}
		case err != nil || !reflect.DeepEqual(got, tt.want):
			t.Errorf("%s: got %v, %v; want %v", tt.name, got, err, tt.want)
		}
	}
}
