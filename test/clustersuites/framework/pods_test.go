package framework

import (
	"testing"
	"time"
)

func TestParseTimedLog(t *testing.T) {
	got, err := ParseTimedLog("2026-11-29T03:40:01.123456789Z {\"event\":\"add\"}\n\n2026-11-29T03:40:02Z a line with blanks \n")
	if err != nil {
		t.Fatal(err)
	}
	want := []TimedLine{
		{time.Date(2026, 11, 29, 3, 40, 1, 123456789, time.UTC), `{"event":"add"}`},
		{time.Date(2026, 11, 29, 3, 40, 2, 0, time.UTC), "a line with blanks "},
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if !got[i].At.Equal(want[i].At) || got[i].Text != want[i].Text {
			t.Errorf("line %d: %+v, want %+v", i+1, got[i], want[i])
		}
	}
	if _, err := ParseTimedLog("no time here\n"); err == nil {
		t.Error("a line without a time parsed")
	}
}
