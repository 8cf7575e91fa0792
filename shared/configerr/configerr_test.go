package configerr

import (
	"errors"
	"testing"
)

func TestErrorRendersEachLayout(t *testing.T) {
	ps := []Problem{{Message: "no source"}, {Field: "PGHOST", Message: "empty"}}
	cause := errors.New("boom")
	for _, c := range []struct {
		err  *Error
		want string
	}{
		{&Error{Subject: "route", Source: "ROUTES", Problems: ps[1:]}, "route: invalid configuration in ROUTES (1 problem):\nPGHOST: empty"},
		{&Error{Subject: "route", Problems: ps}, "route: invalid configuration (2 problems):\nno source\nPGHOST: empty"},
		{&Error{Subject: "dbpool", What: "database configuration", OneLine: true, Problems: ps}, "dbpool: invalid database configuration: no source; PGHOST: empty"},
		{&Error{Subject: "dispatcher", Err: cause}, "dispatcher: invalid configuration: boom"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("Error() = %q, want %q", got, c.want)
		}
	}
	if !errors.Is(&Error{Subject: "f", Err: cause}, cause) {
		t.Error("Error does not unwrap to its cause")
	}
}
