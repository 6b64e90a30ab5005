package scheduler

import "errors"

// ErrInvalidSchedule is returned for a cron specification that does not parse.
var ErrInvalidSchedule = errors.New("invalid cron schedule")
