package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Cron schedules of periodic sweeps are configuration, whether they come from this package's keys
// or from a StorageClass annotation: the rule of what is a valid schedule lives here, once, and
// the scheduler parses with it.

// parser accepts the standard five cron fields and the descriptors (@hourly, @every 1h30m).
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseSchedule parses a cron specification as the StorageClass annotation and the configuration
// accept it: five fields (minute hour day-of-month month day-of-week) or a descriptor, optionally
// after a CRON_TZ=<zone> prefix. The error wraps ErrInvalidSchedule and names the spec.
func ParseSchedule(spec string) (cron.Schedule, error) {
	s, err := CheckSchedule(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v (want five fields \"minute hour day-of-month month day-of-week\", or @hourly, @daily, @every 1h)", ErrInvalidSchedule, spec, err)
	}
	return s, nil
}

// scheduleReference is the instant from which a schedule must fire at least once. Any fixed
// instant works: robfig/cron looks five years ahead, which covers every date a valid spec names.
var scheduleReference = time.Date(2024, time.January, 1, 0, 0, 0, 0, time.UTC)

// CheckSchedule parses spec and rejects what parses but cannot work: a schedule that never fires
// (robfig/cron then returns the zero time, which would fire in a loop), an @every below one second
// (cron silently rounds it up), and a time zone prefix without a schedule after it (which panics
// in robfig/cron v3.0.1). The error says only what is wrong, for callers that name the spec.
func CheckSchedule(spec string) (sched cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("the cron parser failed: %v", r)
		}
	}()
	spec = strings.TrimSpace(spec)
	body := spec
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		i := strings.IndexByte(spec, ' ')
		if i < 0 {
			return nil, errors.New("a time zone prefix must be followed by a space and the schedule, as in CRON_TZ=Europe/Berlin 0 3 * * *")
		}
		body = strings.TrimSpace(spec[i:])
	}
	s, err := parser.Parse(spec)
	if err != nil {
		return nil, err
	}
	if rest, ok := strings.CutPrefix(body, "@every "); ok {
		if d, err := time.ParseDuration(strings.TrimSpace(rest)); err == nil && d < time.Second {
			return nil, fmt.Errorf("@every needs an interval of at least 1s, not %s", d)
		}
	}
	if s.Next(scheduleReference).IsZero() {
		return nil, errors.New("it names a date that never occurs")
	}
	return s, nil
}
