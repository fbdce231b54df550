package bench

import (
	"testing"
	"time"
)

func TestParseRounds(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		err  bool
	}{{"", 10, false}, {"3", 3, false}, {"0", 0, true}, {"-2", 0, true}, {"ten", 0, true}} {
		got, err := parseRounds(c.in)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("parseRounds(%q) = %d, %v; want %d, error %v", c.in, got, err, c.want, c.err)
		}
	}
}

func TestFloatMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2}} {
		if got := floatMedian(c.in); got != c.want {
			t.Errorf("floatMedian(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestGapFigure(t *testing.T) {
	us := time.Microsecond
	for _, c := range []struct {
		d, redir, none time.Duration
		want           string
		ok             bool
	}{
		{70 * us, 100 * us, 20 * us, "38% of the way (70.0 µs; none 20.0, REDIRECT 100.0)", true},
		{90 * us, 100 * us, 20 * us, "12% of the way (90.0 µs; none 20.0, REDIRECT 100.0)", false},
		{110 * us, 100 * us, 20 * us, "-12% of the way (110.0 µs; none 20.0, REDIRECT 100.0)", false},
		{20 * us, 20 * us, 20 * us, "n/a of the way (20.0 µs; none 20.0, REDIRECT 20.0)", false},
	} {
		got, ok := gapFigure(c.d, c.redir, c.none, 0.3)
		if got != c.want || ok != c.ok {
			t.Errorf("gapFigure(%v, %v, %v) = %q, %v; want %q, %v", c.d, c.redir, c.none, got, ok, c.want, c.ok)
		}
	}
}

func TestCPUFigure(t *testing.T) {
	us := time.Microsecond
	if got, ok := cpuFigure(12*us, 20*us, 0.6); got != "0.60x (12.0 vs 20.0 CPU µs per request)" || !ok {
		t.Errorf("cpuFigure at the target = %q, %v", got, ok)
	}
	if _, ok := cpuFigure(13*us, 20*us, 0.6); ok {
		t.Error("cpuFigure above the target is met")
	}
	if got, ok := cpuFigure(13*us, 0, 0.6); got != "n/a" || ok {
		t.Errorf("cpuFigure with no REDIRECT figure = %q, %v", got, ok)
	}
}

func TestPerfCtlName(t *testing.T) {
	for in, want := range map[string]string{
		"one CPU/TPROXY + fast path, Istio pod/whole/64 B": "one-cpu-tproxy-fast-path-istio-pod-whole-64-b",
		"spread/no interception/hop/4096 B":                "spread-no-interception-hop-4096-b",
		"/EBPF/":                                           "ebpf",
	} {
		if got := perfCtlName(in); got != want {
			t.Errorf("perfCtlName(%q) = %q, want %q", in, got, want)
		}
	}
}
