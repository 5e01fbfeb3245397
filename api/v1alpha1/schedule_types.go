package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Weekday names a day of the week, as Go's time package spells it.
// +kubebuilder:validation:Enum=Monday;Tuesday;Wednesday;Thursday;Friday;Saturday;Sunday
type Weekday string

// MaintenanceWindow is a span of time in which new tasks may start: either a daily span
// (days, start, end) or a cron schedule with a duration, in an IANA time zone (UTC when unset).
// Tasks already running when a window closes go on to their end; the rest wait for the next opening.
// +kubebuilder:validation:XValidation:rule="(has(self.start) && has(self.end) && !has(self.schedule) && !has(self.duration)) || (has(self.schedule) && has(self.duration) && !has(self.start) && !has(self.end) && !has(self.days))",message="set either start and end (with optional days), or schedule and duration"
// +kubebuilder:validation:XValidation:rule="!has(self.start) || !has(self.end) || self.start != self.end",message="end must differ from start (a window that never closes needs no window)",fieldPath=".end"
type MaintenanceWindow struct {
	// Days the window opens on: the day its start falls on, in its time zone. Every day when empty.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=7
	Days []Weekday `json:"days,omitempty"`
	// Start is when the window opens, "HH:MM" on a 24-hour clock.
	// +optional
	// +kubebuilder:validation:MaxLength=5
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	Start string `json:"start,omitempty"`
	// End is when it closes, "HH:MM"; an end before the start closes on the next day.
	// +optional
	// +kubebuilder:validation:MaxLength=5
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	End string `json:"end,omitempty"`
	// Schedule opens the window at each time of a standard five-field cron expression (minute hour
	// day-of-month month day-of-week, numbers, `*`, ranges, lists and steps), for Duration. Admission
	// checks its shape; a range that runs backwards (22-3) or a schedule that never fires (0 0 30 2 *)
	// fails the operation on the manager's first look, naming this field, before anything runs.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^([*]|[0-5]?[0-9](-[0-5]?[0-9])?)(/[1-9][0-9]?)?(,([*]|[0-5]?[0-9](-[0-5]?[0-9])?)(/[1-9][0-9]?)?)* +([*]|([01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?)(/[1-9][0-9]?)?(,([*]|([01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?)(/[1-9][0-9]?)?)* +([*]|([1-9]|[12][0-9]|3[01])(-([1-9]|[12][0-9]|3[01]))?)(/[1-9][0-9]?)?(,([*]|([1-9]|[12][0-9]|3[01])(-([1-9]|[12][0-9]|3[01]))?)(/[1-9][0-9]?)?)* +([*]|([1-9]|1[0-2])(-([1-9]|1[0-2]))?)(/[1-9][0-9]?)?(,([*]|([1-9]|1[0-2])(-([1-9]|1[0-2]))?)(/[1-9][0-9]?)?)* +([*]|[0-6](-[0-6])?)(/[1-9][0-9]?)?(,([*]|[0-6](-[0-6])?)(/[1-9][0-9]?)?)*$')",message="must be a five-field cron expression: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12) day-of-week (0-6, 0 is Sunday), each *, a number, a range a-b, a step /n (1-99), or a comma list of those"
	Schedule string `json:"schedule,omitempty"`
	// Duration is how long the window stays open after each time of Schedule.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="must be from 1m to 168h"
	Duration *metav1.Duration `json:"duration,omitempty"`
	// TimeZone is an IANA time zone name such as Europe/Berlin; UTC when unset.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)*$`
	TimeZone string `json:"timeZone,omitempty"`
}

// Scheduling says when a group's nodes may start: inside its maintenance windows, and not
// before the soak time after the last node or group, and once its gates pass. On a NodeOperation it is the default for
// every group; a group's own fields replace it field by field.
type Scheduling struct {
	// Windows: no new task starts outside all of them; none means always.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Windows []MaintenanceWindow `json:"windows,omitempty"`
	// PostNodeDelay keeps a node counted against maxUnavailable this long after its task
	// succeeded, so the next node starts only once the last has soaked.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="must be from 0s to 24h"
	PostNodeDelay *metav1.Duration `json:"postNodeDelay,omitempty"`
	// PostGroupDelay is how long a group waits after the group before it succeeded.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="must be from 0s to 24h"
	PostGroupDelay *metav1.Duration `json:"postGroupDelay,omitempty"`
	// Gates must all pass before each node starts, after the windows allow it.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	Gates []Gate `json:"gates,omitempty"`
	// PauseBefore names nodes before which the operation pauses, once each: when one of them
	// would start, nothing new starts until a person resumes (kubectl nodeops resume), which
	// records the node in spec.resumedBefore so that it never pauses there again.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.all(n, n.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$'))",message="each entry must be a node name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
	PauseBefore []string `json:"pauseBefore,omitempty"`
	// Hooks run before and after each node and the operation (docs/how-to/hooks.md); a group's
	// preNode and postNode replace the operation's, point by point.
	// +optional
	Hooks *Hooks `json:"hooks,omitempty"`
}

// Over is s with each field it leaves unset taken from def: a group's scheduling over its
// operation's, as the manager applies it and the CLI shows it.
func (s Scheduling) Over(def Scheduling) Scheduling {
	if len(s.Windows) == 0 {
		s.Windows = def.Windows
	}
	if s.PostNodeDelay == nil {
		s.PostNodeDelay = def.PostNodeDelay
	}
	if s.PostGroupDelay == nil {
		s.PostGroupDelay = def.PostGroupDelay
	}
	if len(s.Gates) == 0 {
		s.Gates = def.Gates
	}
	if len(s.PauseBefore) == 0 {
		s.PauseBefore = def.PauseBefore
	}
	s.Hooks = s.Hooks.Over(def.Hooks)
	return s
}
