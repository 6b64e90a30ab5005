package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	tests := map[string]struct {
		linked Info
		bi     debug.BuildInfo
		want   Info
	}{
		"the link-time flags win over the toolchain's record": {
			linked: Info{Version: "v0.1.0", Commit: "abc"},
			bi:     debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-2026"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "def"}}},
			want:   Info{Version: "v0.1.0", Commit: "abc"},
		},
		"a VCS stamp without the flags": {
			bi: debug.BuildInfo{Main: debug.Module{Version: "v0.1.1-0.20260101000000-0123456789ab"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "false"},
			}},
			want: Info{Version: "v0.1.1-0.20260101000000-0123456789ab", Commit: "0123456789abcdef"},
		},
		"a modified work tree is marked dirty": {
			bi: debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"},
			}},
			want: Info{Commit: "0123456789abcdef-dirty"},
		},
		"nothing recorded leaves both empty for Get to fill": {
			bi:   debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			want: Info{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := tc.linked
			fromBuildInfo(&got, &tc.bi)
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestLineNamesEveryPart(t *testing.T) {
	version, commit = "v9.8.7", "feedface"
	t.Cleanup(func() { version, commit = "", "" })
	got := Line("volume-healer")
	want := "volume-healer v9.8.7 (commit feedface, " + Get().GoVersion + ", " + Get().Platform + ")"
	if got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
}
