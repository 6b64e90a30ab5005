package config

import (
	"errors"
	"strings"
)

// ErrInvalidValue is wrapped by every error about a value that is not allowed: a value of the
// wrong type, a number out of range, a malformed schedule, selector, name or address.
var ErrInvalidValue = errors.New("invalid value")

// ErrUnknownKey is wrapped by errors about a key in the configuration file that volume-healer
// does not know, most often a misspelling that would otherwise be silently ignored.
var ErrUnknownKey = errors.New("unknown key")

// ErrConfigFile is wrapped when the configuration file named by --config or VOLUME_HEALER_CONFIG
// cannot be read or is not a valid YAML mapping.
var ErrConfigFile = errors.New("cannot read config file")

// FieldError reports one rejected configuration key. Load returns all of them at once, joined
// with errors.Join, so that an operator can fix every mistake in one edit.
type FieldError struct {
	// Key is the key as spelled in the configuration file, e.g. "budgets.perNode".
	Key string
	// Source says where the value came from, e.g. "flag --budgets-per-node",
	// "env VOLUME_HEALER_BUDGETS_PER_NODE" or "file /etc/volume-healer/config.yaml, line 12".
	// It is empty when the error comes from Validate, which does not know the sources.
	Source string
	// Value is the rejected value as text (strings quoted); empty for an unknown key.
	Value string
	// Reason says what is allowed instead.
	Reason string
	// Err is ErrInvalidValue or ErrUnknownKey.
	Err error
}

// Error renders the problem on one line: key, source, value and what is allowed.
func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	b.WriteString(e.Key)
	if e.Source != "" {
		b.WriteString(" (")
		b.WriteString(e.Source)
		b.WriteString(")")
	}
	b.WriteString(": ")
	if e.Value != "" {
		b.WriteString(e.Value)
		b.WriteString(" is not allowed: ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// Unwrap returns the sentinel error that classifies the problem.
func (e *FieldError) Unwrap() error { return e.Err }

// ErrInvalidSchedule is returned for a cron specification that does not parse.
var ErrInvalidSchedule = errors.New("invalid cron schedule")
