package framework

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// AgentPort is where meshwire's node agent serves /metrics on the node's
// IP (conf/kubernetes/daemonset.yaml's --listen).
const AgentPort = "9966"

// Metrics reads the node agent's samples on node n: name (labels
// included, as exposed) to value.
func Metrics(ctx context.Context, n Node) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(n.IP, AgentPort)+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s's agent: %w", n.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("node %s's agent: /metrics: %s", n.Name, resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

// Metric is one sample of the node agent on n; an error when the agent
// does not expose it.
func Metric(ctx context.Context, n Node, name string) (float64, error) {
	m, err := Metrics(ctx, n)
	if err != nil {
		return 0, err
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("node %s's agent exposes no %s", n.Name, name)
	}
	return v, nil
}

// MetricIs is a condition for Eventually: the sample is want.
func MetricIs(ctx context.Context, n Node, name string, want float64) func() error {
	return func() error {
		v, err := Metric(ctx, n, name)
		if err != nil {
			return err
		}
		if v != want {
			return fmt.Errorf("%s is %g on %s, want %g", name, v, n.Name, want)
		}
		return nil
	}
}
