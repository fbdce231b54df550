package framework

import "testing"

func TestRender(t *testing.T) {
	got, err := Render([]byte("# @KEPT@\nname: @A@-@B@\n"), map[string]string{"A": "x", "B": "y"})
	if err != nil || string(got) != "# @KEPT@\nname: x-y\n" {
		t.Errorf("Render: %q, %v", got, err)
	}
	if _, err := Render([]byte("name: @A@ @C@\n"), map[string]string{"A": "x"}); err == nil {
		t.Error("a placeholder without a value was rendered")
	}
}
